"""What keeps a long run going: the attempt's state for the bootstrap's restart decisions
(`attempt`), fault injection for tests (`inject`), what a non-finite step does (`nonfinite`)."""
