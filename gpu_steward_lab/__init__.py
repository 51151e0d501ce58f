"""gpu-steward's lab: the local control plane, Prometheus, GPU device stand-in and webhook/descheduler
processes that the demo, the end-to-end tests and the benchmarks run. Lives in the clone only: the image and
the installed package hold the product (`gpu_steward`, `admission`, `descheduler`, `common`), and the import
contracts forbid the product from importing this package."""
