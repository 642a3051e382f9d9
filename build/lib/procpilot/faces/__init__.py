"""Thin adapters: spec-shaped schemas in, engine calls, spec-shaped results out."""
