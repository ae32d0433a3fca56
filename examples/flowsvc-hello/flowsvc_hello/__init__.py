"""An example third-party plugin: a greeting route backed by a counting actor.

Install it (``pip install -e examples/flowsvc-hello``) and add ``"hello"`` to
``[plugins] enabled``; flowsvc finds it through its ``flowsvc.plugins`` entry point.
"""
