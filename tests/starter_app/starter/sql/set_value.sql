UPDATE models SET value = :value WHERE name = :name
