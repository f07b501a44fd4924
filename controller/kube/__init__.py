"""Kubernetes plumbing: client construction, API errors, object shapes, leader election."""
