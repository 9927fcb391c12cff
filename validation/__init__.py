"""The validation harness behind `phantora-validate`: compares simulated results with ground-truth records."""
