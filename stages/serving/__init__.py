"""SGLang servers around a run, apart from the generation client itself: launching one for a stage
and stopping it with the run (launch), watching a generation run's progress and the servers'
/metrics (monitor), and measuring a drafter served with EAGLE-3 against the same target served
alone (bench)."""
