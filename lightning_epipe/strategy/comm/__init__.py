"""What crosses a cut: message headers, streams, the transport over a point-to-point backend, collectives."""
