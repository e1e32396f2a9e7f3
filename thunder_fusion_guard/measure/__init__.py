"""What the guard measures while it compiles: the cost constants (calibration, and its cache) and regions
near break-even; the timing helpers they share."""
