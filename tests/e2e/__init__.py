"""The product as a user runs it: CLI, dashboard in a browser, example app, installed wheel, chaos, bench."""
