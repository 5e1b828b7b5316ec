"""What the dialer asks and tells: the pre-call answer, the campaign schedule, per-turn usage."""
