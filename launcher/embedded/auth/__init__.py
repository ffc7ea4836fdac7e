"""Who may do what, in outside mode (docs/embedded.md "Outside mode"): the cluster's certificates,
the service-account tokens it signs and verifies, and RBAC over the Roles and bindings it stores."""
