"""Adapters that run other training frameworks' loops as coadapt jobs (import them directly)."""
