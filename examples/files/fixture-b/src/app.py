def parse_reading(line):
    # TODO: handle empty lines
    return float(line.split(",")[1])
