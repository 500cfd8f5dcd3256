"""rawgrad against PyTorch: the ops of issue 17, forward and backward."""
