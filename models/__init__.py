"""Model side of attnbench: attention variants (``models.attention``) and backbones."""
