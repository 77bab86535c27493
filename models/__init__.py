"""One module per problem. Each defines the KernelBench contract (Model, ModelNew, get_inputs, get_init_inputs)
plus what the harness needs: CASES (small odd inputs, built on a device), traffic() for the roofline column,
and BOUND ('memory' or 'compute')."""
