"""The fleet changing: signed deploy events, discovered boxes, and the gateway told which boxes are ready."""
