"""The sweep: factors and names (spec), its files, aggregation (results) and the driver."""
