"""Adapters that let other training engines call the project's credit estimators."""
