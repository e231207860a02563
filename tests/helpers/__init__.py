"""What the tests share and are not tests themselves: servers to start, media to make, reference
computations, fakes of outside services, and scripts the tests run as processes.

Imported as `helpers.NAME`: pytest puts tests/ on sys.path (rootdir conftest, no tests/__init__.py).
"""
