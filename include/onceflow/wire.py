"""The wire contract: header names, event types, record kinds, exit codes, the base exception."""
