"""The real-Kubernetes test tier: build.sh, harness.py, plugin.py (fixtures), smoke tests."""
