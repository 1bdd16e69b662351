"""Model and cluster catalogs, validity rules and the feasible-space generator. Imports nothing heavy."""
