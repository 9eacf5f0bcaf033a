"""Integrations with training frameworks, one module each; each imports its framework only when used."""
