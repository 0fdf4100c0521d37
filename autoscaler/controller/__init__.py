"""The controller: lifecycle, store, reconcile and the control loop (see ``loop``)."""
