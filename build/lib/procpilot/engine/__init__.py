"""The supervisor core: sessions, capture, trees. It knows nothing of faces or transports."""
