"""Graph attention networks with the suite's attention variants (PyG ``MessagePassing``)."""
