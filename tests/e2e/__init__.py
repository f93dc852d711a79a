"""End to end with a real Mosquitto: the daemon over MQTT, ACLs, faults, kill -9 restarts, a full disk, deploy/, TLS."""
