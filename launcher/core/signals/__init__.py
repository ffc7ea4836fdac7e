"""What the controller observes of a run: nodes, pods and the JobSet, reduced to an Observation."""
