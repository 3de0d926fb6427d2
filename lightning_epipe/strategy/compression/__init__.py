"""A codec per stream: the codec book, ``compressor="auto"``, learned bottlenecks, delta keys."""
