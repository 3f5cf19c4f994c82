"""Cost models: each prices a `StepPlan` in seconds. Heavy ones (torch) are imported lazily."""
