"""Long-context tasks: passkey retrieval, BABILong, synthetic copying."""
