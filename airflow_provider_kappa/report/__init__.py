"""The backfill's HTML report and its time axis: written by validate, linked by the operators,
printed by the CLI and drawn again by the demo."""
