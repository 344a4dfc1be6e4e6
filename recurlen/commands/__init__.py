"""The command line (one table of commands), the demo pipeline, the report and the preflight."""
