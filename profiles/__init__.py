"""Shipped profiles, calibrations and traces (YAML data; installed with slo-console so names like
`--profile quickstart` resolve from any directory)."""
