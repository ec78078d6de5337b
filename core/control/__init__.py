"""The embedded controller: scheduling modes (fcfs, saber, slos-serve, adaserve), their seams, the gateway."""
