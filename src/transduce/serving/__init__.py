"""Serving over HTTP: the translation server, the pieces every server shares, dynamic batching, the web page."""
