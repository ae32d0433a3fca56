"""The run engine: from a submitted run to its recorded end.

It owns the run queue actor and its slots (``run_queue``), the one way to submit a run
(``submit``), the execution of one run within its limits (``execute``), the agent loop
(``agent_loop``), the model backends it asks for turns (``model_backends``), the built-in
agent tools, templates and offline plans (``tools``, ``templates``, ``offline_plans``), a
run's git workspace (``workspace``), the run rows and their leases (``run_rows``), the
publisher that commits a run's events and fans them out (``run_publisher``) and how a
run's end is recorded with its project's status and webhook event (``ending``). It writes
to the live stream (``live``) and moves project records (``records``).
"""
