"""The Consumer controller: keeps each Consumer's status.databaseCount current."""
