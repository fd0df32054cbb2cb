"""Placeholder: filled by later issues."""
