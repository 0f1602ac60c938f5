def harvest_weight(kg_per_bed, beds):
    # FIXME: beds may be empty
    return kg_per_bed * len(beds)
