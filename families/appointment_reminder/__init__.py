"""The appointment_reminder family: load -> compose -> deliver (see ``pipeline.yaml``),
in two variants (email, sms). ``impl.get_appointment_reminder_pipeline`` wires it;
importing ``impl`` registers it for the worker."""
