"""Several replicas on one database: box leases, the gate the reconciler asks, others' warm-up progress."""
