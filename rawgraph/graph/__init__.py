"""Graphs: capture, inspect, instantiate, patch in place, update, verify."""
