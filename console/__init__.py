"""slo-console's command line and Textual operator console."""
