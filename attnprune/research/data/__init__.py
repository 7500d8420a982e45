"""Data: synthetic generators and text datasets (HF datasets online; files offline)."""
