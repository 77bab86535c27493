"""The sandbox a candidate runs in: how the box is made (bubblewrap, limits), how it is started early and adopted,
and its entry point."""
