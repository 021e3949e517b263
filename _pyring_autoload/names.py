"""The backend's name and devices as registered with torch: read by this entry point and by
pyring's backend (pyring/c10d/backend.py). Imports nothing."""

BACKEND_NAME = "pyring"
# The devices whose tensors the backend's group takes, as registered with torch.
DEVICES = ("cpu", "cuda")
