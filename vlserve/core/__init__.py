"""The layer under everything else in vlserve: the request, the forward batch and its logits-row
layout, one step's plan and result, errors and configuration. Imports nothing above it
(docs/ARCHITECTURE.md, "Layers")."""
