def restock(item, amount):
    # FIXME: negative amounts
    return {item: amount}
