def open_ticket(customer):
    return {"customer": customer, "status": "open"}
