"""Train short, test long: position encodings and RoPE scalings compared past the training length."""
