"""The controller: the reconcile loop, what a pass reads, its health endpoint, and the launch and
stop of a run that the loop then drives."""
