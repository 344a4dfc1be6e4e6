"""Lightning callbacks that run recurlen's diagnostics during validation."""
