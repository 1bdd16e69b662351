"""What a layout costs: parameter placement, memory per GPU, step time, and the analytic backend.

Pure arithmetic on `search_spaces` specs; nothing here imports Ray, Optuna, torch or megatron.
`placement` (where the parameters are), `memory` + `activations` (peak bytes per GPU), `throughput` +
`efficiency` (step time and its fitted constants), `analytic` (the backend that runs the rules and both models).
"""
