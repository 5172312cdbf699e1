"""Durable storage for messages and definitions."""
