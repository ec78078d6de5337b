"""SLOs-Serve (paper 004): multi-SLO admission by dynamic programming, batch formation with a dynamic batch
size, SLO-adaptive speculation, a best-effort tier for bursts, and SLO-driven routing across replicas."""
