"""coadapt's in-job library: what a user's PyTorch training script imports.

Needs torch, never a cloud SDK.
"""
