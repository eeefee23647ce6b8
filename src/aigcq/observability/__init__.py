"""Metrics exposition and log formatting."""
